"""The worker's faust runtime beside `app/main.py`: the faust App built from Settings, the frames'
producer and the worker's small web server. faust lives here, in agents/ and in tables/ only."""
