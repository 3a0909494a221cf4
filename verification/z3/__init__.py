"""flightcheck's Z3 engines (BMC, k-induction, parameterised proofs).

Z3 takes SIGINT for itself while a query runs (its `ctrl_c` parameter): the
query returns `unknown` and the Ctrl-C never reaches Python, so the command
would carry on as if the query had merely failed. Ctrl-C belongs to the
command (flightcheck/commands/interrupts.py stops a running query through
the context instead), so Z3's own handler is turned off here, where every
engine is imported.
"""

import z3

z3.set_param("ctrl_c", False)
