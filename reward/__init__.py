"""The Bradley-Terry preference model: data formats, loss, trainer, scoring, the demo task's gold oracle."""
