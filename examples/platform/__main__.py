from examples.platform.server import main

main()
