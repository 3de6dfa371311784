"""Training: examples, feature caches, the DataModule and the LightningModule."""

from omegaconf import OmegaConf

from drafters.training.checks import job_dir

# conf/train.yaml's run_dir uses it; registered wherever a training config is composed
OmegaConf.register_new_resolver("job_dir", job_dir, replace=True)
