"""Where input and output live: local paths, and object stores (``s3://``, ``http(s)://``)
through well-kept layers (pyarrow.fs for S3, the standard library's HTTP client for
``http``), shared by phase 1 (input), phase 2 and the driver (output)."""
