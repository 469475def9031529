"""Who may do what: bearer tokens checked against each route's right (``rights``), and
what a browser is shown when it has none (``login``)."""
