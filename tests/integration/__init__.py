"""Tests of several modules together: the public model as a whole, every executor alike, the
documentation's examples, plugins as installed, and the built wheel."""
