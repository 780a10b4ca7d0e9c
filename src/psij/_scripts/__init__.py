"""The text of the scripts psij writes for jobs: quoting of user strings and Mustache rendering.

Batch submit scripts (:mod:`psij.executors.batch`), the staging script parts of batch jobs
(:mod:`psij.executors._staging`) and pilot task scripts (:mod:`psij.executors.pilot`) all take
their quoting and their rendering from here, so there is one of each:

- :mod:`psij._scripts.quoting`: one escape function per place a string can go in a script;
- :mod:`psij._scripts.generator`: :class:`~psij._scripts.generator.TemplatedScriptGenerator`,
  which renders a Mustache template with those escapes;
- :mod:`psij._scripts.mustache`: the parsed template turned into functions (pystache's rules);
- :mod:`psij._scripts.template_functions`: the functions templates get as ``psij.lib``.

The modules make text only: they never start processes, and the package imports nothing from
the executors, so every executor can use it without loading another. Plugins and users keep
importing the same names from their PSI/J paths (``psij._scripts.quoting``,
``.script_generator``, ``.template_function_library``), which re-export them. This file imports
nothing, so that quoting alone does not load pystache.
"""
