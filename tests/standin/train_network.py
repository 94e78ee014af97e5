"""Stand-in for sd-scripts' train_network.py (see standin_trainer.py)."""

from standin_trainer import main

if __name__ == "__main__":
    main("train_network.py", "sd15")
