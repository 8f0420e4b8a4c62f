"""What the MiniLM suites (``sst``, ``faithfulness``, ``squad``) share: the
fine-tuned classifier and the SST splits (:mod:`.loading`), DiffMask's fit on
them and the model scored under its gates (:mod:`.fitting`), any method over a
data set sentence by sentence (:mod:`.attributions`) and the reports'
convergence table (:mod:`.convergence`)."""
