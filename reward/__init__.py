"""Every reward rsft scores with, a leaf that imports nothing from rsft/ (tests/test_imports.py):

- the sources and how they are named: trained, pretrained, function, http, combination (sources, specs), the HTTP
  client and server (http_client, server), the checkers of verifiable tasks (checkers);
- the Bradley-Terry preference model: pair formats and tables (formats, tables), encoding, its loss, the
  backbone it is built on (backbone), its trainer and the trained model's scorer (trained);
- the demo task's gold oracle and simulated annotators (gold, annotators);
- what they stand on: loading a model or tokenizer (loading), file digests (digests), the refusal types
  (refusals, which rsft.errors re-exports).
"""
