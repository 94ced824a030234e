"""What speculation costs on this machine and what it is worth: the cost model
(cost_model), the per-token draft-length rule (draft_length), calibration and its
cache (calibration), verify-cost curves (verify_curve) and the machine-load check
(machine_load).  May import: core and below.
"""
