"""Review with your team: blind pairwise review of two checkpoints, a run's sample browser with flags, results
(win rate, agreement between people, agreement of a reward model or judge with people) and exports that feed
reward-model training, DPO and eval suites. The store is SQLite (store.py); the web app is Starlette (app.py)."""
