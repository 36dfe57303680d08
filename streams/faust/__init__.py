"""The wall around Faust and aiokafka: every patch to them and every read of their internals.
Written for one faust-streaming version; importing `streams.faust.patches` refuses another."""
