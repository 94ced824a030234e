"""What speculation costs on this machine and what it is worth: the cost model
(cost_model), the per-token draft-length rule (draft_length) and what it learns of
the draft's acceptance (confidence), calibration and its cache (calibration),
verify-cost curves (verify_curve), the machine-load check (machine_load), and cost
profiles of machines we cannot run on, with the pricing of recorded rounds
(profiles).  May import: core and below.
"""
