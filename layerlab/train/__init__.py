"""``layerlab train-check``: a few optimizer steps on one fixed batch, and what they show.

One concept per module: :mod:`~layerlab.train.run` (the loop and ``train_check``),
:mod:`~layerlab.train.loss` (output, loss, target), :mod:`~layerlab.train.section` (a spec's
``train:``), :mod:`~layerlab.train.optim` (the optimizer, on the copy), :mod:`~layerlab.train.fit`
(did the loss fall; above the loss's exact floor, :mod:`~layerlab.train.floor`, when its target has one), :mod:`~layerlab.train.updates` (gradient norms, update/weight ratios),
:mod:`~layerlab.train.frozen` (parameters that never changed, and why), :mod:`~layerlab.train.diverge`
(the first NaN/Inf and its module), :mod:`~layerlab.train.unregistered` (tensors the loss trains
through that are not registered parameters), :mod:`~layerlab.train.squashed` (a softmax/sigmoid before
a loss that applies one itself), :mod:`~layerlab.train.objective` (the loss built from the first step's output),
:mod:`~layerlab.train.forward_blame` (the module a raising forward failed in, from ``layerlab.inspect``),
:mod:`~layerlab.train.replay` (the run again from the same weights with one thing changed, the evidence
for :mod:`~layerlab.train.high_dropout`, dropout too high to overfit, and :mod:`~layerlab.train.summed`,
a loss summed over the batch under SGD), :mod:`~layerlab.train.report` (the result objects).
"""
