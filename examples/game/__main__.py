from examples.game.server import main

main()
