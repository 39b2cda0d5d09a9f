"""What the test layers share: stream builders and strategies, the worker core's test wiring,
the API tests' rows and tokens, test doubles of the ports, paths. Test modules import from here,
never from one another."""
