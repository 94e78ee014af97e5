from kohya_tuner.cli.app import main

main()
