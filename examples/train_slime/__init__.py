"""Train with slime: a FOCUS collection as slime's custom rollout function."""
