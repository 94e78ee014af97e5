"""kohya-tuner: fit Kohya sd-scripts LoRA training to the GPU you have."""

__version__ = "0.1.0"
