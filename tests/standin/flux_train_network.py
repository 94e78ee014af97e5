"""Stand-in for sd-scripts' flux_train_network.py (see standin_trainer.py)."""

from standin_trainer import main

if __name__ == "__main__":
    main("flux_train_network.py", "flux")
