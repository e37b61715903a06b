"""Train the embedded tiny model on the toy task with batches FOCUS collected."""
