"""Training: examples, feature caches, the DataModule and the LightningModule."""
