"""What a researcher looks at: plotly figures read from reports (`plots`) and the ipywidgets
panels that build a config and call the library (`widgets`). Nothing here computes a result.
"""
