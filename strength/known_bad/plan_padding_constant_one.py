"""The plan group's constant is exported as ``REQ_POOL_IDX_PADDING = 1`` while the kernels keep
treating pool row 0 as padding: breaks CONTRACT §14 (the constant is ``0``). An engine that
marks its padding rows with the exported value would have every padding row planned as a
request, and its request in pool row 1 dropped."""

from strength.known_bad._mutate import export

export(globals())
REQ_POOL_IDX_PADDING = 1
