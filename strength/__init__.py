"""The suite's strength: proof that it fails where it must.

- ``known_bad/``: the catalogue of canary with one realistic bug each;
- ``gate``: runs the suite on every catalogue entry (each must be killed) and on both
  implementations (each must pass); what counts as a kill is written there, once;
- ``gate_record``: the pytest plugin the gate loads to record each failure's kind;
- ``mutation/``: cosmic-ray configs, its fork server, the survivor replay tool and the
  survivor triage data.
"""
