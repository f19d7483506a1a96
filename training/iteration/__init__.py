"""One RL iteration's rules, without Dagster, one module per stage; the assets (assets/iteration.py,
assets/rollouts.py, assets/verification.py) load their inputs, call these, and attach metadata.

    tasks -> sampling -> verification -> training_step -> held_out      (lineage: which checkpoint)

- Iteration N samples from checkpoint N-1 (the base policy for N = 1), verified by its content
  hash (`lineage`). Refused: a checkpoint whose blocking stability checks failed, one that is not
  what iteration N-1's training step recorded (another run replaced it), and one whose lineage no
  longer holds: some training step before it started from a checkpoint since replaced (a re-run
  of an earlier iteration, a rebuilt base policy). The training step refuses trajectories another
  policy sampled (`training_step`), and the evaluation a checkpoint other than the one its training
  step recorded, or off its lineage (`held_out`).
- Every random choice of an iteration comes from one seed (`context.IterationRef.seed`): which
  train tasks it samples, the rollouts, the order of dynamic sampling's reserve, the re-graded
  share. Evaluation samples with the experiment's seed alone, so every checkpoint meets the same
  draws.
- Every sample is graded in a fresh sandbox through the sandbox pool (`verification.Grader`);
  dynamic sampling refills the batch while too few groups carry a learning signal, and a share of
  the submissions is graded twice to measure how reproducible verdicts are (`verification.verify`).
- After the training step, its health signals are the trainer's metrics beside the iteration's
  sample metrics (datastore/metrics.py), judged against the experiment's monitors, and stored as
  the `checkpoints` row (`training_step.judge_step`).
- Held-out evaluation covers the base policy (iteration 0) first, again whenever the stored one
  evaluated another base policy than the one on disk (`held_out`).
- Re-grading stores a past iteration's trained-on submissions graded by today's verifier beside
  the original verdicts (`regrading`).
"""
