"""Raw logs to Parquet (schema, preprocess, synth) and Parquet to batches (dataset)."""
