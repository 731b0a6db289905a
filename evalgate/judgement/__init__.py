"""Judgement: what stored runs mean. First divergences, one verdict per request, the factors a pass can
change, and lm-eval metrics beside them."""
