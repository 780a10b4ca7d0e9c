"""In-allocation ("pilot") execution: many tasks scheduled inside one allocation.

Pure parts (no I/O, no threads, no clock): ``resource_values`` (nodes, requests, shapes,
shares) and ``resources`` (the pool and its arithmetic), ``scheduler`` (which task runs next),
``tasks`` (task descriptions and events, with their JSON) and ``_engine_events`` (what reaches
the engine thread).

Parts with I/O: ``engine`` (the loop: one thread that owns the task processes through
``_task_process``, the agents' sockets through ``_remote_nodes``, the journal's writes and
listener delivery; ``_task_books`` holds its books under one lock), ``journal`` (the journal
file's one schema, writer and reader), ``_run_dir`` (run folders), ``agent`` (the process that
runs tasks on another node), ``service`` (the served pilot's socket and its clients)
and ``executor`` (the PSI/J executor).

``qcg`` is the package of the QCG-PilotJob file interface (``psij pilot run`` of a request
file: its requests read, planned and reported); it drives the engine, which knows nothing of it.
"""
