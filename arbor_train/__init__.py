"""ArborTrain: train, export and evaluate the learned parts of the ArborMem conversational memory."""

__version__ = "0.1.0"
