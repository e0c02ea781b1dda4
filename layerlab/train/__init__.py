"""``layerlab train-check``: a few optimizer steps on one fixed batch, and what they show.

One concept per module: :mod:`~layerlab.train.run` (the loop and ``train_check``),
:mod:`~layerlab.train.loss` (output, loss, target), :mod:`~layerlab.train.section` (a spec's
``train:``), :mod:`~layerlab.train.optim` (the optimizer, on the copy), :mod:`~layerlab.train.fit`
(did the loss fall), :mod:`~layerlab.train.updates` (gradient norms, update/weight ratios),
:mod:`~layerlab.train.frozen` (parameters that never changed, and why), :mod:`~layerlab.train.diverge`
(the first NaN/Inf and its module), :mod:`~layerlab.train.unregistered` (tensors the loss trains
through that are not registered parameters), :mod:`~layerlab.train.squashed` (a softmax/sigmoid before
a loss that applies one itself), :mod:`~layerlab.train.report` (the result objects).
"""
