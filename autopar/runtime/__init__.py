"""The local multi-process runtime: what runs a compiled plan on the local machine's processes.

``launch`` starts N local processes joined by a gloo group (examples, tests, ``autopar run``,
``compile_many``'s training); ``checkpoint`` saves and loads a compiled module and its optimizer
sharded (``autopar.save_checkpoint``/``load_checkpoint``); ``many_run`` is one rank's share of a
many-model schedule (``autopar.compile_many``'s ``ManyModels.train``). It sits above ``codegen``
(the program a rank runs) and ``planning`` (the schedule it follows), below the public API; under
``torchrun`` only ``checkpoint`` is needed.
"""
