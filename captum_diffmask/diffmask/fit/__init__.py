"""How :meth:`DiffMask.fit <captum_diffmask.diffmask.explainer.DiffMask.fit>`
trains the probe: its options, the loop and its state, one step, the checkpoint
selection, the fit's state on disk and the fit under ``torch.distributed``."""
