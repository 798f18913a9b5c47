"""The ``authsvc`` command and its subcommands: they parse arguments, call the operations layer
(authsvc/operations/) and print (README.md, "Layout"). The web path never imports it."""
