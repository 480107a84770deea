"""What the tests share: in-memory test doubles of the transport interfaces
(:mod:`tests.support.doubles`), a web world over real partition tasks
(:mod:`tests.support.webworld`), store damage (:mod:`tests.support.damage`) and the
crash-point launcher of the crash tests (:mod:`tests.support.crashpoint`)."""
