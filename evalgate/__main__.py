from .cli import main

if __name__ == "__main__":  # guarded: worker processes are spawned and re-import __main__
    main()
