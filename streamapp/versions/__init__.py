"""Table versions: their states from the members directory (:mod:`.states`), the retired
ones this process knows (:mod:`.retired`) and the app's ledger of retirements, with the
watch that drops retired stores (:mod:`.ledger`). Which version a view answers from is
the engine's (:mod:`streamapp.engine.served`); ``streamapp retire`` is
:mod:`streamapp.cli.retire`."""
