"""Phase 2 and publishing: fetch each partition's partials, merge them with perfect rollup,
write segments, and publish them with a manifest.

``merge`` runs in the Spark tasks, ``durable`` makes their files durable in one batch,
``shards`` builds each segment's shardSpec and ``publish`` moves staged segments into place
and writes the manifest last.
"""
