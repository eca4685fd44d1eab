import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';

import { MeshModel } from './model';
import { MeshSidebar } from './sidebar';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16" height="16">
<g class="jp-icon3" fill="#616161">
<circle cx="5" cy="5" r="2.6"/><circle cx="19" cy="5" r="2.6"/>
<circle cx="5" cy="19" r="2.6"/><circle cx="19" cy="19" r="2.6"/>
<circle cx="12" cy="12" r="3"/>
<path d="M6.3 6.3l4 4M17.7 6.3l-4 4M6.3 17.7l4-4M17.7 17.7l-4-4" stroke="#616161" stroke-width="1.4"/>
</g></svg>`;

const meshIcon = new LabIcon({ name: 'actormesh:mesh', svgstr: ICON_SVG });

/** The actormesh sidebar: the live mesh of the current notebook's kernel, with controls. */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'actormesh:sidebar',
  description: 'The live actormesh mesh of the current notebook, with controls',
  autoStart: true,
  requires: [INotebookTracker],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker) => {
    const model = new MeshModel();
    const sidebar = new MeshSidebar(model);
    sidebar.title.icon = meshIcon;
    app.shell.add(sidebar, 'left', { rank: 950 });

    const follow = () => model.follow(tracker.currentWidget?.sessionContext ?? null);
    tracker.currentChanged.connect(follow);
    follow();

    app.commands.addCommand('actormesh:open-sidebar', {
      label: 'Show the actormesh mesh sidebar',
      execute: () => app.shell.activateById(sidebar.id)
    });
    console.log('actormesh sidebar activated');
  }
};

export default plugin;
