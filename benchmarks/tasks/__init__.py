"""Tasks (data, models and ground truth) on which the attribution methods are evaluated."""
