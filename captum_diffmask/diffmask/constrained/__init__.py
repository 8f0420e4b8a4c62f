"""The constrained optimisation a DiffMask fit runs, in the manner of cooper's
split: the KL constraint, the Lagrange multipliers and the rule that moves them,
and the criterion that says when the game between gates and multipliers has
settled. It knows nothing of models or probes."""
