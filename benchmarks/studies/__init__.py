"""Studies beside the suites: one question each, with its own command
(``python -m benchmarks.studies.NAME``) and, where it has one, a committed report
under ``docs/results/``.

- ``sst_sweep``: DiffMask fits on SST with options changed per run, scored on
  held-out train sentences (or dev); the convergence reports.
- ``sst_erasure_tuning``: the per-example masks' settings for ``sst-erasure``,
  chosen on train sentences.
- ``readout_tuning``: the Readout Bottleneck's learning rate for a suite, chosen
  on held-out train sentences.
- ``sst_seed_spread``: the spread of the attributions across fit seeds, per epoch.
- ``squad_convergence``: the SQuAD fits' verdicts, chunk by chunk.
- ``distributed_fit`` and ``scaling``: a fit under ``torchrun`` and the scaling report.
- ``model_zoo``: DiffMask on every architecture of transformers' mappings.
- ``first_explanation``: the README's first explanation, timed step by step.
- ``components_sst_per_task``: the components suite's per-task SST heads mask
  fitted with options changed per run, on train sentences.
- ``stacking_speed`` and ``attribution_speed`` (their shared set-up in ``sst_study``):
  a fit step with the layers' masked passes stacked, and the attribution at every
  layer, against one forward pass, on the sst suite's MiniLM.
- ``peer_agreement`` (with ``peer_ferret`` and ``peer_inseq``, run in the peers' own
  environment): our ERASER metrics against ferret's, our Integrated Gradients
  against inseq's, on the same inputs.
"""
