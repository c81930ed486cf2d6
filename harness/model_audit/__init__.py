"""`h3bench model PATH.py:ATTR`: a whole model through the batch-invariance assertion with localisation,
under each global mode and compiled (factory.py: the model the factory returns, as a function of its
examples and parameters; audit.py: one mode's verdict and origins; op_audit.py: the built-in op that audits
an origin's op; compiled.py: the compiled model at N, N/2, ..., 1; modes.py: each mode in its own process;
command.py: the command, from parsed options to an exit code; __main__.py: a mode's child process)."""
