// Loaded by the notebook front-end for this kernel.
