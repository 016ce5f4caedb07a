"""Shared measures: answer matching, hedge rules and LoCoMo F1 (answers), the Ubuntu IRC reply-structure
metrics (irc), and the training metrics (training). Evaluation, data generation and training all score
with these, so they live in the library."""
