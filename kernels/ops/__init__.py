"""Every operation of the decoder, one package each: its kernel(s), launcher, tile rules and traffic model.
kernels.operations declares each once for the code that reads them all."""
