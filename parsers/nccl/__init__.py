"""NCCL's own records -> collective rows (``tracelens.model.nccl.NCCL_ROW_SCHEMA``): ``log``
(``NCCL_DEBUG=INFO`` output, every launcher's prefixes, many ranks to a file or one file per rank)
and ``flight_recorder`` (PyTorch's Flight Recorder dumps, pickle through a restricted unpickler,
or JSON).  Each module's ``read(path, file=0) -> NcclParse``; neither gives an event table, as
neither source has a timeline of kernels: they are read on their own (``parsers.collective_parser_for``)."""
