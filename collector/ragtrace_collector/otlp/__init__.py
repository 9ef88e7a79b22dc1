"""OTLP wire code shared by receivers, storage and exporters: decoding, splitting by
trace and re-encoding requests (:mod:`.codec`), reading and writing protobuf fields in
place (:mod:`.protowire`), parsing large requests in pieces (:mod:`.piecewise`), and
span attribute values (:mod:`.spanattrs`)."""
