"""What-if: calibrate the simulator on a measured run, replay its workload under other settings.

Why: every real tuning iteration (the seed's loop: change a knob, test again) costs GPU hours.
`calibrate` fits the simulator's cost constants to one measured run; `whatif` replays the same
requests through the calibrated simulator for every knob combination and ranks them.
"""
