"""Replay of conversations through memory methods: the methods (arbor_train.replay.methods: ArborMem and
the retrieval baselines behind one interface) and session replay (arbor_train.replay.sessions), shared by
evaluation (eval/) and reader supervision (data_gen/reader.py)."""
