"""What a user touches: explanations of raw text (:mod:`~captum_diffmask.interface.explanation`),
methods side by side (:mod:`~captum_diffmask.interface.side_by_side`,
:mod:`~captum_diffmask.interface.comparison`), attributions of generated text
(:mod:`~captum_diffmask.interface.generation`), figures and HTML pages
(:mod:`~captum_diffmask.interface.figures`, :mod:`~captum_diffmask.interface.html`),
and the command line (:mod:`~captum_diffmask.interface.cli`). The top layer: it
may import every other."""
