"""aiokafka adapters shared by processes that are not faust workers: producing records in batches
(the worker's runtime uses it too) and the operator console's reads of the topics."""
