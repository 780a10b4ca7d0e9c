"""In-allocation ("pilot") execution: many tasks scheduled inside one allocation.

``resources`` holds the resource arithmetic (nodes, requests, concrete shares) and
``scheduler`` the pure task scheduler built on it. Neither does I/O; processes, sockets and
files belong to the executor that drives them.
"""
