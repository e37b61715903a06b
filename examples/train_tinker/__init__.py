"""Train with Tinker: a FOCUS batch as Tinker Datums, sent with forward_backward/optim_step."""
