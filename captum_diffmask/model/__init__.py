"""How the library reaches into a user's model, whatever the method: where its
sites and components are (:mod:`~captum_diffmask.model.site_finding`,
:mod:`~captum_diffmask.model.sites`, :mod:`~captum_diffmask.model.components`),
how it is called and what its output is (:mod:`~captum_diffmask.model.forward`,
:mod:`~captum_diffmask.model.batches`, :mod:`~captum_diffmask.model.outputs`,
:mod:`~captum_diffmask.model.texts`), the divergences between two outputs
(:mod:`~captum_diffmask.model.divergences`), and the base every method shares
(:mod:`~captum_diffmask.model.attribution`). Nothing here knows DiffMask: this
layer imports no other layer of the library."""
