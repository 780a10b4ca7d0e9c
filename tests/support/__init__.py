"""What the tests share and are not tests themselves: fakes of schedulers and users, process
checks, hostile inputs, and the map of where each test module went. Imported as
``from support.NAME import ...``; pytest collects nothing here."""
