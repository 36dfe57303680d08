"""Wire formats: input events, outputs, stored state and DLQ records, their codecs, and the
config's JSON Schema. Depends on `engine`; never on `streams`."""
