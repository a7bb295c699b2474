"""The env contract: what every environment implements (``core``), the errors the wire API
returns (``errors``), the input rules (``inputs``), and the few helpers an env may use
(``cache``, ``sites``, ``problems``, ``dialects``). An env imports only this package and itself
(``tests/test_layers.py``)."""
